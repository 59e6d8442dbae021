#!/usr/bin/env python3
"""KServe's storage initializer: ``initialize SOURCE_URI DEST_DIR [...]`` copies each model (s3://, gs://, ...)
into its directory with kserve-storage, reading the S3 settings KServe's pod webhook puts in the environment.
A failure is one line on stderr (the pod's termination message) and exit 1."""

import sys

from kserve_storage import Storage


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print("usage: initialize SOURCE_URI DEST_DIR [SOURCE_URI DEST_DIR ...]", file=sys.stderr)
        return 2
    sources, dests = argv[0::2], argv[1::2]
    try:
        Storage.download_files(sources, dests)
    except Exception as e:  # kserve-storage raises plain exceptions (RuntimeError, ValueError, botocore's)
        print(f"storage-initializer: {', '.join(sources)}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
