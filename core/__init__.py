"""What every app uses, below audit in the import order: the staff-page guard, the API's
strict pagination and query filters, plotly figures as HTML fragments, and the minting and
hashing of bearer tokens. No models, no templates, no Django app of its own."""
