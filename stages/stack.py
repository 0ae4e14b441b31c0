"""DVC stage `stack`: build the fp32 text stack from the verified snapshot and record what it is.

results/stack.json: the stack's structure (read off the built modules), its fp32 bytes, the
stage's peak resident memory, and the load time.
"""
from scripts import atomic, layout, metrics, snapshot, text_stack
from scripts.errors import run_stage
from scripts.measure import peak_rss_bytes


def main() -> None:
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    _, info = text_stack.load_text_stack(path)
    info.update({"repo": rec["repo"], "revision": rec["revision"], "source": rec["source"],
                 "peak_rss_bytes": peak_rss_bytes()})
    atomic.write_json(layout.result_path("stack"), info)
    metrics.write("stack", bytes=info["fp32_bytes"], seconds=info["load_seconds"],
                  peak_rss_mb=info["peak_rss_bytes"] / 2**20)
    print(f"stack: {info['layers']} layers, {info['params']} params, {info['fp32_bytes'] / 2**20:.1f} MiB fp32, "
          f"peak RSS {info['peak_rss_bytes'] / 2**20:.0f} MiB")


if __name__ == "__main__":
    run_stage(main)
