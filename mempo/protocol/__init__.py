"""The agent protocol: tags, the turn grammar and format rules (`grammar`), the outcome reward
(`reward`) and the memory / full context policies (`memory`)."""
