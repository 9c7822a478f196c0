"""How long one n-gram proposal takes as the context grows (the index keeps it flat).

    python bench/ngram_lookup.py
"""

import random
import time

from engines.speculative.ngram import NGramIndex


def main() -> None:
    rng = random.Random(0)
    print(f"{'context':>8} {'extend µs/token':>16} {'propose µs':>11}")
    for n in (1_000, 8_000, 32_000, 128_000):
        tokens = [rng.randrange(2000) for _ in range(n)]
        p = NGramIndex(1, 4)
        t0 = time.perf_counter()
        p.extend(tokens)
        extend = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(2000):
            p.propose(7)
        propose = (time.perf_counter() - t0) / 2000
        print(f"{n:>8} {extend * 1e6:>16.2f} {propose * 1e6:>11.2f}")


if __name__ == "__main__":
    main()
