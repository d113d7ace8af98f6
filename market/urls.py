from django.urls import path

from market import staff_views, views

urlpatterns = [
    path("", views.market_overview, name="market_overview"),
    path("bids/", views.bid_list, name="bid_list"),
    path("bids/new/", views.bid_new, name="bid_new"),
    path("bids/preview/", views.bid_preview, name="bid_preview"),
    path("bids/<int:pk>/", views.bid_detail, name="bid_detail"),
    path("bids/<int:pk>/edit/", views.bid_change, name="bid_edit"),
    path("bids/<int:pk>/cancel/", views.bid_cancel_view, name="bid_cancel"),
    path("spend/", views.spend, name="spend"),
    path("admin/tiers/", staff_views.staff_tiers, name="staff_tiers"),
    path("admin/tiers/<int:pk>/", staff_views.staff_tier_update, name="staff_tier_update"),
    path("admin/rounds/", staff_views.staff_rounds, name="staff_rounds"),
    path("admin/rounds/<int:pk>/", staff_views.staff_round_detail, name="staff_round_detail"),
]
