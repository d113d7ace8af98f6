from django.urls import path

from alerts import views

urlpatterns = [
    path("", views.alerts_page, name="alerts"),
    path("webhooks/new/", views.webhook_new, name="alert_webhook_new"),
    path("webhooks/<int:pk>/disable/", views.webhook_disable_view, name="alert_webhook_disable"),
]
