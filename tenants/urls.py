from django.urls import include, path

from tenants import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("notifications/read/", views.notifications_mark_read, name="notifications_read"),
    path("team/members/", views.team_members, name="team_members"),
    path("team/members/role/", views.team_member_role, name="team_member_role"),
    path("team/members/remove/", views.team_member_remove, name="team_member_remove"),
    path("team/campaigns/", views.team_campaigns, name="team_campaigns"),
    path("team/budgets/", views.team_budget_set, name="team_budget_set"),
    path("staff/tenants/", views.staff_tenants, name="staff_tenants"),
    path("staff/credits/", views.staff_credits, name="staff_credits"),
    path("staff/budgets/", views.staff_budgets, name="staff_budgets"),
    path("tokens/", include("tenants.token_views")),
]
