"""The checkpoint snapshot: fetched from the hub or generated (the tiny and the real-width
synthetic checkpoints), and the record that pins its bytes.
"""
