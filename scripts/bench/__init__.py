"""Benchmarks (figures under results/, never assertions): conversion, the GPU peers, the real-width
run and the report that extrapolates it to clef-flash.
"""
