"""The capacity curve: the hit rate a finite KV cache keeps at each capacity, in memory or streamed."""
