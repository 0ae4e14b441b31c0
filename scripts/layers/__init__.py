"""Model-independent layers: the GatedDeltaNet kernel forms (the grammar) and the chunked kernel each
form computes.
"""
