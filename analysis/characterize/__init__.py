"""Seed 001's characterization dataset: one Parquet table across runs (``dataset``), the latency–throughput
curve and the SLO capacity per configuration (``curves``), and the recommender (``recommend``):
``python -m analysis.characterize recommend DATASET --slo ttft=…,itl=… --users N --cost CFG=USD_PER_H``.
"""
