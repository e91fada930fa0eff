"""What a model and a GPU are: the catalogues and FLOPs that the timing model and the cost model share."""
