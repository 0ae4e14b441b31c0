"""How the pipeline runs: params.yaml and its schema, where things go, atomic writes, the one
error type, measurements, metrics rows and provenance.
"""
