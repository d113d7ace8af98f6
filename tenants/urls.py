from django.urls import path

from tenants import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]
