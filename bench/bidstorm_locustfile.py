"""Locust users for bench/bidstorm.py (run through it, not on their own).

BID_TOKENS: researcher API tokens (comma-separated); BID_ROUND: the open round's id;
BID_MODE: "storm" (place, edit and cancel in the last minute of a round) or "place" (place
only, for the throughput ratio), "unbooked" (place on bench/bare_api, the same endpoint without
escrow, budget check and audit; its bids are not recorded as confirmed, the wrapper deletes
them) or "bare" (the baseline site's one-row write).

The users are locust's FastHttpUser (geventhttpclient): with the default client, locust alone
took most of a core at 950 requests a second, so the bare baseline measured the load
generator as much as the server.
"""

import itertools
import json
import os
import random

from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

TOKENS = os.environ.get("BID_TOKENS", "").split(",")
ROUND = int(os.environ.get("BID_ROUND", "0"))
MODE = os.environ.get("BID_MODE", "storm")
# Every bid the server confirmed (201) is appended here, so the wrapper can check that each one
# is in the database and settled, whatever requests were still in flight when the run ended.
PLACED = os.environ.get("BID_PLACED_FILE", "")
TIERS = ("a100", "h100")
_next_token = itertools.cycle(TOKENS)


def _body() -> dict:
    tier = random.choice(TIERS)
    return {
        "round": ROUND,
        "quantity": random.choice((1, 1, 2, 4)),
        "limits": {tier: f"{random.randrange(1_000, 9_000) / 1000:.3f}"},
        "note": "storm",
    }


class Researcher(FastHttpUser):
    wait_time = constant(0)

    def on_start(self) -> None:
        self.headers = {
            "Authorization": f"Bearer {next(_next_token)}",
            "Content-Type": "application/json",
        }
        self.mine: list[int] = []

    def _expect(self, response, ok: tuple[int, ...], name: str) -> None:
        # 409 is the market saying no on purpose (round closed, budget, a bid already
        # cancelled): counted apart, under its own name, not as an error.
        if response.status_code in ok:
            response.success()
        elif response.status_code == 409:
            response.success()
            self.environment.events.request.fire(
                request_type="409",
                name=name,
                response_time=0,
                response_length=0,
                exception=None,
                context={},
            )
        else:
            response.failure(f"{response.status_code}: {response.text[:200]}")

    @task(6)
    def place(self) -> None:
        if MODE == "bare":
            with self.client.post(
                "/bare/",
                data=json.dumps(_body()),
                name="bare write",
                catch_response=True,
                headers=self.headers,
            ) as r:
                self._expect(r, (201,), "bare write")
            return
        with self.client.post(
            "/api/v1/bids",
            data=json.dumps(_body()),
            name="place",
            catch_response=True,
            headers=self.headers,
        ) as r:
            self._expect(r, (201,), "place")
            if r.status_code == 201 and MODE != "unbooked":
                bid_id = r.json()["id"]
                self.mine.append(bid_id)
                if PLACED:
                    with open(PLACED, "a") as f:
                        f.write(f"{bid_id}\n")

    @task(2)
    def edit(self) -> None:
        if MODE != "storm" or not self.mine:
            return
        bid = random.choice(self.mine)
        body = {"limits": {random.choice(TIERS): f"{random.randrange(1_000, 9_000) / 1000:.3f}"}}
        with self.client.patch(
            f"/api/v1/bids/{bid}",
            data=json.dumps(body),
            name="edit",
            catch_response=True,
            headers=self.headers,
        ) as r:
            self._expect(r, (200,), "edit")

    @task(1)
    def cancel(self) -> None:
        if MODE != "storm" or not self.mine:
            return
        bid = self.mine.pop(random.randrange(len(self.mine)))
        with self.client.post(
            f"/api/v1/bids/{bid}/cancel",
            name="cancel",
            catch_response=True,
            headers=self.headers,
        ) as r:
            self._expect(r, (200,), "cancel")
