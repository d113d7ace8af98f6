from django.urls import include, path

urlpatterns = [
    path("v1/telemetry/", include("telemetry.api.urls")),
]
