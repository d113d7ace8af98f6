"""Policy pages, mounted at /market/policy/ (staff only)."""

from django.urls import path

from market.policy import views

urlpatterns = [
    path("", views.policy_list, name="policy_list"),
    path("new/", views.policy_edit, name="policy_new"),
    path("shadow/", views.shadow_compare, name="policy_shadow_compare"),
    path("shadow/clear/", views.policy_shadow_clear, name="policy_shadow_clear"),
    path("rounds/<int:pk>/void/", views.round_void_view, name="policy_round_void"),
    path("v<int:number>/", views.policy_detail, name="policy_detail"),
    path("v<int:number>/edit/", views.policy_edit, name="policy_edit"),
    path("v<int:number>/activate/", views.policy_activate_view, name="policy_activate"),
    path("v<int:number>/shadow/", views.policy_shadow_view, name="policy_shadow"),
    path("v<int:number>/replay/", views.policy_replay, name="policy_replay"),
]
