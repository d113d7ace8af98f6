"""The market policy's room: its staff pages (views, forms, urls, charts), its reads
(selectors: versions, alerts, the shadow comparison), the guardrail limits and checks, and the
replay of past rounds under a candidate. Every write it makes goes through market.services."""
