from tenants.access import membership_of


def membership(request):
    return {"membership": membership_of(getattr(request, "user", None))}
