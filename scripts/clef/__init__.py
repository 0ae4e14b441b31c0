"""`clef`: the command line of a clef-litert release (installed as the `clef` console script and
runnable as `python -m clef`; the package lives at scripts/clef/, see pyproject.toml).

    clef run --text "..."            the smallest row graph that fits; hidden-state summary, top tokens
    clef run --pair --text CONTEXT --question Q [--question Q ...]   one shared prefix, many suffixes
    clef verify DIR                  every hash, every signature on its reference record
    clef audit FILE.tflite           what produced a graph, from its own metadata, and the manifest's word
"""
