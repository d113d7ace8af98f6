"""``market_bid_place(...)``: a bid, its limits and its escrow hold in one round trip.

``market.services.bids.bid_place`` calls it on PostgreSQL for a bid it has already validated
in Python. In one call, in the lock order of every market path: the round share-locked if it
is open for bidding, the tiers found (each active), the tenant's available and escrow accounts
locked in primary-key order, then (only when no budget can apply, or the caller has checked
them under these locks) the bid, its limits, the hold transfer, its two entries and both
balances written, and last the audit chain's lock taken and its head read
(``audit_chain_head``), so the caller appends the two events onto it and commits.

It writes nothing and answers ``fallback`` for anything the Python path words an error for
(round not open, unknown or inactive tier, missing account, escrow out of range, credits short,
an idempotency key already used or racing), and ``budgets`` when a budget may apply; the
caller then takes the reference path, or checks the budgets and calls again. The arithmetic
is ``cost_ceil``'s: quantity x highest limit x whole seconds of the window / 3600, rounded up.
"""

from django.db import migrations

PG_FORWARD = """
CREATE FUNCTION market_bid_place(
  p_round bigint, p_now timestamptz, p_stamp timestamptz, p_tenant bigint, p_author integer,
  p_campaign bigint, p_quantity integer, p_min_quantity integer, p_note text,
  p_key text, p_slugs text[], p_prices bigint[], p_budgets_checked boolean,
  p_max_amount bigint, p_chain_key bigint,
  OUT outcome text, OUT bid_id bigint, OUT escrow bigint, OUT transfer_id bigint,
  OUT head_seq bigint, OUT head_hash varchar)
VOLATILE LANGUAGE plpgsql AS $$
DECLARE
  v_seconds bigint;
  v_cost numeric;
  v_tiers bigint[];
  v_available bigint;
  v_balance bigint;
  v_escrow_account bigint;
  v_account record;
  v_n integer;
BEGIN
  outcome := 'fallback';
  SELECT floor(extract(epoch FROM r.ends_at - r.starts_at))::bigint INTO v_seconds
    FROM market_round AS r
   WHERE r.id = p_round AND r.status = 'open' AND r.closes_at > p_now
     FOR SHARE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT array_agg(t.id ORDER BY s.ord), count(*) INTO v_tiers, v_n
    FROM unnest(p_slugs) WITH ORDINALITY AS s(slug, ord)
    JOIN market_tier AS t ON t.slug = s.slug AND t.active;
  IF v_n <> cardinality(p_slugs) THEN
    RETURN;
  END IF;
  -- Rounded up, in exact integers: (x + 3599) div 3600 for x >= 0.
  v_cost := div(p_quantity::numeric * (SELECT max(p) FROM unnest(p_prices) AS p) * v_seconds
                + 3599, 3600);
  IF v_cost < 1 OR v_cost > p_max_amount THEN
    RETURN;
  END IF;
  escrow := v_cost::bigint;
  -- FOR UPDATE locks the rows as they leave the sort, so in pk order.
  FOR v_account IN
    SELECT a.id, a.kind, a.balance FROM tenants_account AS a
     WHERE a.tenant_id = p_tenant AND a.kind IN ('available', 'escrow')
     ORDER BY a.id FOR UPDATE
  LOOP
    IF v_account.kind = 'available' THEN
      v_available := v_account.id;
      v_balance := v_account.balance;
    ELSE
      v_escrow_account := v_account.id;
    END IF;
  END LOOP;
  IF v_available IS NULL OR v_escrow_account IS NULL THEN
    RETURN;
  END IF;
  IF p_key <> '' AND EXISTS (
    SELECT 1 FROM market_bid AS b WHERE b.tenant_id = p_tenant AND b.idempotency_key = p_key
  ) THEN
    RETURN;
  END IF;
  IF NOT p_budgets_checked AND EXISTS (
    SELECT 1 FROM tenants_budget AS b
     WHERE b.tenant_id = p_tenant AND b.active
       AND (b.campaign_id IS NULL OR b.campaign_id = p_campaign)
  ) THEN
    outcome := 'budgets';
    RETURN;
  END IF;
  IF v_balance < escrow THEN
    RETURN;
  END IF;
  INSERT INTO market_bid (
    tenant_id, author_id, round_id, campaign_id, order_id, backfill_id, quantity,
    min_quantity, escrow, status, note, outcome, outcome_reason, idempotency_key, created_at,
    updated_at)
  VALUES (p_tenant, p_author, p_round, p_campaign, NULL, NULL, p_quantity, p_min_quantity,
          escrow, 'open', p_note, '', '', p_key, p_stamp, p_stamp)
  ON CONFLICT DO NOTHING  -- only the idempotency key is unique here: it raced
  RETURNING id INTO bid_id;
  IF bid_id IS NULL THEN
    RETURN;
  END IF;
  INSERT INTO market_bidlimit (bid_id, tier_id, price, charge_limit)
    SELECT bid_id, t, p, NULL FROM unnest(v_tiers, p_prices) AS l(t, p);
  INSERT INTO tenants_transfer (
    kind, tenant_id, amount, source_id, destination_id, campaign_id, reference, reason,
    actor_id, created_at)
  VALUES ('hold', p_tenant, escrow, v_available, v_escrow_account, p_campaign,
          'bid:' || bid_id, format('escrow for bid %s in round %s', bid_id, p_round),
          p_author, p_stamp)
  RETURNING id INTO transfer_id;
  INSERT INTO tenants_entry (transfer_id, account_id, amount)
  VALUES (transfer_id, v_available, -escrow), (transfer_id, v_escrow_account, escrow);
  UPDATE tenants_account AS a
     SET balance = a.balance + CASE WHEN a.id = v_available THEN -escrow ELSE escrow END
   WHERE a.id IN (v_available, v_escrow_account);
  SELECT h.seq, h.hash INTO head_seq, head_hash FROM audit_chain_head(p_chain_key) AS h;
  outcome := 'placed';
END;
$$;
"""
PG_REVERSE = """
DROP FUNCTION IF EXISTS market_bid_place(
  bigint, timestamptz, timestamptz, bigint, integer, bigint, integer, integer, text,
  text, text[], bigint[], boolean, bigint, bigint);
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD, params=None)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REVERSE, params=None)


class Migration(migrations.Migration):
    dependencies = [("market", "0010_energy"), ("audit", "0004_chain_head")]
    operations = [migrations.RunPython(forward, reverse)]
