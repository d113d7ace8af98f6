"""The REST API: /api/v1/ resources, the OpenAPI schema and its documentation pages.

Resource paths have no trailing slash (/api/v1/allocations/7/pace). Each app keeps its
serializers and viewsets in <app>/api/; this module only mounts them.
"""

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.urls import include, path, re_path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)
from rest_framework.routers import DefaultRouter

from audit.api.views import AuditEventViewSet
from governance.api.views import ChangeRequestViewSet
from market.api.views import (
    AllocationViewSet,
    BidViewSet,
    OrderViewSet,
    RoundViewSet,
    TierViewSet,
)
from planning.api.views import PlannedCampaignViewSet, ScenarioViewSet
from telemetry.api.views import AllocationPaceView
from tenants.api.views import (
    BalanceView,
    BudgetViewSet,
    CampaignViewSet,
    LedgerViewSet,
    MeView,
    NotificationViewSet,
    api_not_found,
)


class ApiRouter(DefaultRouter):
    # One representation (JSON): no ".json" twins of every route.
    include_format_suffixes = False


router = ApiRouter(trailing_slash=False)
router.register("tiers", TierViewSet, basename="tier")
router.register("rounds", RoundViewSet, basename="round")
router.register("bids", BidViewSet, basename="bid")
router.register("allocations", AllocationViewSet, basename="allocation")
router.register("orders", OrderViewSet, basename="order")
router.register("ledger", LedgerViewSet, basename="transfer")
router.register("budgets", BudgetViewSet, basename="budget")
router.register("campaigns", CampaignViewSet, basename="campaign")
router.register("notifications", NotificationViewSet, basename="notification")
router.register("audit", AuditEventViewSet, basename="audit-event")
router.register("approvals", ChangeRequestViewSet, basename="change-request")
router.register("planning/campaigns", PlannedCampaignViewSet, basename="planned-campaign")
router.register("planning/scenarios", ScenarioViewSet, basename="scenario")

urlpatterns = [
    path("v1/telemetry/", include("telemetry.api.urls")),
    path("v1/me", MeView.as_view(), name="api-me"),
    path("v1/balance", BalanceView.as_view(), name="api-balance"),
    path("v1/allocations/<int:pk>/pace", AllocationPaceView.as_view(), name="allocation-pace"),
    path("v1/", include(router.urls)),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file, so the page needs no
    # inline script under the Content-Security-Policy.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    # ReDoc starts from an inline script and runs its search in a blob: worker: allowed on this
    # page only (it shows our own schema and nothing a user typed).
    path(
        "redoc/",
        csp_update({"script-src": [UNSAFE_INLINE], "worker-src": ["blob:"]})(
            SpectacularRedocView.as_view(url_name="api-schema")
        ),
        name="api-redoc",
    ),
    # Last: any other /api/ path answers 404 in the API's JSON error shape, not an HTML page.
    re_path(r"^.*$", api_not_found),
]
