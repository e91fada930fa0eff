"""Encoding records: chat rendering, tokenising with a memo, chained block hashes, dense ids, workers."""
