"""Every planning write: declared campaigns (``campaigns``) and scenario runs (``scenarios``)."""
