"""An instance and its forms: the dataclasses and arrays, JSON in and out, a part's columns, the result, the command."""
