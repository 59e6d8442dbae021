"""``edl data prepare``: ready-to-train data sets."""

from __future__ import annotations

import argparse


def cmd_data_prepare(a: argparse.Namespace) -> int:
    from edl.data.prepare import prepare_digits, prepare_synthetic, prepare_tokens

    if a.kind == "digits":
        info = prepare_digits(a.out, shards=a.shards, seed=a.seed)
    elif a.kind == "tokens":
        info = prepare_tokens(a.out, a.rows, a.length, a.vocab, a.classes, shards=a.shards, seed=a.seed)
    else:
        info = prepare_synthetic(a.out, a.rows, a.features, a.classes, shards=a.shards, seed=a.seed)
    width = f"{info['features']} tokens of {a.vocab}" if a.kind == "tokens" else f"{info['features']} features"
    print(f"wrote {info['train_rows']} training rows to {a.out.rstrip('/')}/train and "
          f"{info['test_rows']} held-out rows to {a.out.rstrip('/')}/test "
          f"({width}, {info['classes']} classes)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``data prepare`` command."""
    d = sub.add_parser("data", help="data set tools")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    dp = dsub.add_parser("prepare", help="write a ready-to-train data set (train/ and test/)",
                         description="Write Parquet shards with an integer id column: digits (scikit-learn's bundled "
                                     "8x8 digits), synthetic (float features labelled by a fixed random teacher) "
                                     "or tokens (token sequences labelled by a fixed random bag-of-words teacher, "
                                     "for the zoo's transformers).")
    dp.add_argument("kind", choices=["digits", "synthetic", "tokens"], help="which data set")
    dp.add_argument("--out", required=True, help="destination: a path, file:///dir or s3://bucket/prefix")
    dp.add_argument("--rows", type=int, default=20000,
                    help="synthetic, tokens: number of rows, at least 10 (default 20000)")
    dp.add_argument("--features", type=int, default=256, help="synthetic: input width, at least 1 (default 256)")
    dp.add_argument("--classes", type=int, default=10,
                    help="synthetic, tokens: number of classes, at least 2 (default 10)")
    dp.add_argument("--length", type=int, default=64, help="tokens: tokens per row, at least 1 (default 64)")
    dp.add_argument("--vocab", type=int, default=8192, help="tokens: vocabulary size, 2..2**24 (default 8192)")
    dp.add_argument("--shards", type=int, default=4,
                    help="Parquet files in train/, at least 1 and at most the training rows (default 4)")
    dp.add_argument("--seed", type=int, default=0, help="random seed, 0..2**32-1 (default 0)")
    dp.set_defaults(fn=cmd_data_prepare)
