"""Tree verification: drafting interface, trees, acceptance rules, the decoding engine, reports."""
