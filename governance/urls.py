from django.urls import path

from governance import views

urlpatterns = [
    path("", views.approvals_queue, name="approvals_queue"),
    path("new/<slug:kind>/", views.approval_new, name="approval_new"),
    path("<int:pk>/approve/", views.approval_approve, name="approval_approve"),
    path("<int:pk>/reject/", views.approval_reject, name="approval_reject"),
    path("<int:pk>/withdraw/", views.approval_withdraw, name="approval_withdraw"),
    path("team/", views.team_requests, name="team_requests"),
]
