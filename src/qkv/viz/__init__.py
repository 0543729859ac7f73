"""Pictures and explanations of a trained run's attention.

``attention`` holds the objects every picture is drawn from (a job's predictor builds them),
``heatmaps`` draws them as PNGs, ``page`` as one interactive HTML page, ``explain`` recomputes
one query step by step, and ``curves`` draws training curves and the positional encoding.
"""
