"""One module per view. Each projection is plain logic over (records, store); see base.py."""
