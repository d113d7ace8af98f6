"""POST /api/v1/bids as the platform serves it, less the market's bookkeeping.

The same gunicorn, middleware, token authentication, bid throttle, serializers, tier and
round checks (the round row locked, as a bid must be) and the same answer, with the bid and
its limits written in one transaction, but without the three things the bid-storm goal
names: the escrow hold in the ledger, the budget check and the audit event. The ratio of
place-bid throughput to this one is what those three cost. Bench only: the bids it writes
hold no escrow, so bench/bidstorm.py deletes them before the round closes.
"""

from django.db import transaction
from django.urls import path
from rest_framework import status
from rest_framework.response import Response

from market.api.serializers import BidCreateSerializer, BidSerializer
from market.api.views import BidViewSet, limits_checked
from market.models import Bid, BidLimit
from market.services._common import now_or
from market.services.bids import _round_open_locked, _terms

NOTE = "no bookkeeping"


class BidWithoutBookkeeping(BidViewSet):
    def create(self, request):
        serializer = BidCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        limits = limits_checked(data["limits"])
        with transaction.atomic():
            terms = _terms(
                quantity=data["quantity"], min_quantity=data["min_quantity"], limits=limits
            )
            locked = _round_open_locked(round_id=data["round"], now=now_or(None))
            bid = Bid.objects.create(
                tenant=self.tenant,
                author=request.user,
                round=locked,
                quantity=terms.quantity,
                min_quantity=terms.min_quantity,
                escrow=0,
                note=NOTE,
            )
            BidLimit.objects.bulk_create(
                [
                    BidLimit(bid=bid, tier=terms.tiers[slug], price=price)
                    for slug, price in terms.limits.items()
                ]
            )
        answer = BidSerializer(bid, context={"placed_limits": limits})
        return Response(answer.data, status=status.HTTP_201_CREATED)


urlpatterns = [path("api/v1/bids", BidWithoutBookkeeping.as_view({"post": "create"}))]
