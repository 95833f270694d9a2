"""The embedded default's database engine: Django's SQLite, whose flush opens the permit the freeze triggers of
gates/migrations/0013 ask for (a DELETE of a signed plan's criteria is refused at any other time)."""
