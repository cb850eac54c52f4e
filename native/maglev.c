// SPDX-License-Identifier: Apache-2.0
/*
 * Maglev table fill for the agent (user space, not BPF): lace/datapath/maglev.py's table(), the
 * same algorithm bit for bit, loaded through ctypes. The Python version is the reference and the
 * fallback; this one exists because the fill is a tight loop over every position of every table
 * (1021 positions, a few probes each), which CPython runs ~100x slower: an agent meeting tens of
 * thousands of services at start-up fills as many tables.
 *
 * Backends take turns, in the order given, claiming the next position of their own permutation
 * (offset, offset + skip, ... modulo size) that no one holds yet, until the table is full.
 * Backend IDs are non-zero (0 marks a free position); size is a prime and every skip is in
 * [1, size - 1], so each permutation visits every position.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int lace_maglev_fill(const uint32_t *offset, const uint32_t *skip, const uint32_t *ids, uint32_t n,
		     uint32_t size, uint32_t *entry)
{
	uint32_t *next, filled = 0, i;

	memset(entry, 0, (size_t)size * sizeof(*entry));
	if (n == 0)
		return 0;
	next = malloc((size_t)n * sizeof(*next));
	if (!next)
		return -1;
	for (i = 0; i < n; i++) {
		if (!ids[i] || offset[i] >= size || !skip[i] || skip[i] >= size) {
			free(next);
			return -1;
		}
		next[i] = offset[i];
	}
	for (;;) {
		for (i = 0; i < n; i++) {
			uint32_t c = next[i], s = skip[i];

			while (entry[c]) {
				c += s;
				if (c >= size)
					c -= size;
			}
			entry[c] = ids[i];
			c += s;
			if (c >= size)
				c -= size;
			next[i] = c;
			if (++filled == size) {
				free(next);
				return 0;
			}
		}
	}
}
