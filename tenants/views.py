from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from tenants.access import tenant_of
from tenants.ledger import balance_get


@login_required
def dashboard(request):
    tenant = tenant_of(request.user)
    balance = balance_get(tenant=tenant) if tenant else None
    return render(request, "tenants/dashboard.html", {"tenant": tenant, "balance": balance})
