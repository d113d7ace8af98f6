from django.urls import path

from telemetry.efficiency import views

urlpatterns = [
    path("", views.team_efficiency, name="team_efficiency"),
    path("teams/", views.staff_efficiency, name="staff_efficiency"),
]
