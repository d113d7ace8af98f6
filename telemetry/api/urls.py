from django.urls import path

from telemetry.api import views

app_name = "telemetry-api"

urlpatterns = [
    # The agent posts to ".../ingest" (no slash, and it does not follow redirects); the
    # slashed form is accepted too rather than redirected, which would lose the POST body.
    path("ingest", views.ingest, name="ingest"),
    path("ingest/", views.ingest),
    path("actions/", views.EnforcementActionList.as_view(), name="actions"),
]
