from django.urls import include, path

from telemetry import views

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("gpus/<int:pk>/maintenance/", views.gpu_maintenance, name="gpu_maintenance"),
    path("enforcement/", views.enforcement_list, name="enforcement_list"),
    path("allocations/", views.allocation_list, name="allocation_list"),
    path("allocations/live/", views.allocations_live, name="allocations_live"),
    path("allocations/<int:pk>/", views.allocation_detail, name="allocation_detail"),
    path("efficiency/", include("telemetry.efficiency.urls")),
]
