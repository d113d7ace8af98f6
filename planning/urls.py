from django.urls import path

from planning import views

urlpatterns = [
    path("campaigns/", views.planned_campaigns, name="planned_campaigns"),
    path(
        "campaigns/<int:pk>/withdraw/",
        views.planned_campaign_withdraw_view,
        name="planned_campaign_withdraw",
    ),
    path("scenarios/", views.scenarios, name="scenarios"),
    path("scenarios/<int:pk>/", views.scenario_detail, name="scenario_detail"),
    path("scenarios/<int:pk>/plan.csv", views.scenario_csv, name="scenario_csv"),
]
