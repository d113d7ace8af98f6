"""The writer's canonical form of many events (``canonical_encoded``) is byte for byte the
verifier's (``canonical``), on any event."""

from __future__ import annotations

from datetime import UTC, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.chain import canonical, canonical_encoded, json_text

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_moment = st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]))
_key = st.none() | st.integers(min_value=0)


@settings(deadline=None)  # no clock in a test: the host may be busy
@given(
    seq=st.integers(min_value=1),
    created_at=_moment,
    actor_id=_key,
    tenant_id=_key,
    labels=st.tuples(st.text(), st.text(), st.text(), st.text(), st.text(), st.text()),
    before=_json,
    after=_json,
)
def test_the_encoded_form_is_the_canonical_form(
    seq, created_at, actor_id, tenant_id, labels, before, after
):
    actor_label, action, object_type, object_id, prev_hash, key_id = labels
    fields = dict(
        seq=seq,
        created_at=created_at,
        actor_id=actor_id,
        actor_label=actor_label,
        tenant_id=tenant_id,
        action=action,
        object_type=object_type,
        object_id=object_id,
        prev_hash=prev_hash,
        key_id=key_id,
    )
    assert canonical_encoded(
        **fields, before=json_text(before), after=json_text(after)
    ) == canonical(**fields, before=before, after=after)
