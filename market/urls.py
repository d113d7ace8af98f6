from django.urls import path

from market import energy_views, order_views, staff_views, views

urlpatterns = [
    path("", views.market_overview, name="market_overview"),
    path("bids/", views.bid_list, name="bid_list"),
    path("bids/new/", views.bid_new, name="bid_new"),
    path("bids/preview/", views.bid_preview, name="bid_preview"),
    path("bids/<int:pk>/", views.bid_detail, name="bid_detail"),
    path("bids/<int:pk>/edit/", views.bid_change, name="bid_edit"),
    path("bids/<int:pk>/cancel/", views.bid_cancel_view, name="bid_cancel"),
    path("spend/", views.spend, name="spend"),
    path("spend/energy.csv", energy_views.energy_csv, name="energy_csv"),
    path("orders/", order_views.order_list, name="order_list"),
    path("orders/new/", order_views.order_new, name="order_new"),
    path("orders/<int:pk>/", order_views.order_detail, name="order_detail"),
    path("orders/<int:pk>/edit/", order_views.order_change, name="order_edit"),
    path("orders/<int:pk>/pause/", order_views.order_pause_view, name="order_pause"),
    path("orders/<int:pk>/resume/", order_views.order_resume_view, name="order_resume"),
    path("orders/<int:pk>/cancel/", order_views.order_cancel_view, name="order_cancel"),
    path("admin/tiers/", staff_views.staff_tiers, name="staff_tiers"),
    path("admin/tiers/<int:pk>/", staff_views.staff_tier_update, name="staff_tier_update"),
    path("admin/rounds/", staff_views.staff_rounds, name="staff_rounds"),
    path("admin/rounds/<int:pk>/", staff_views.staff_round_detail, name="staff_round_detail"),
]
