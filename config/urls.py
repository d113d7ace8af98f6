from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path

from telemetry.views import metrics


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page links; send them to the static icon."""
    return redirect(static("favicon.svg"), permanent=True)


urlpatterns = [
    path("favicon.ico", favicon),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("api/", include("config.api_urls")),
    path("market/policy/", include("market.policy.urls")),
    path("market/", include("market.urls")),
    path("fleet/", include("telemetry.urls")),
    path("audit/", include("audit.urls")),
    path("governance/", include("governance.urls")),
    path("planning/", include("planning.urls")),
    path("alerts/", include("alerts.urls")),
    path("", include("tenants.urls")),
]
