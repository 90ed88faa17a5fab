"""The ``cpu-demo`` preset's example bodies: what its warm start teaches the model to write.

Each continues the built-in prompt (which ends with the signature and the docstring) and respects
the sorting task's bans: no ``sorted()``, ``.sort()``, ``heapq`` or imports. The correct ones pass
the task's tests; the wrong ones fail or crash in the ways a small model's attempts do. Nothing in
the reward knows which is which (``cpu_demo``).
"""

from __future__ import annotations

CORRECT_BODIES: dict[str, tuple[str, ...]] = {
    "sorting": (
        # insertion sort
        "    ys = list(xs)\n"
        "    for i in range(1, len(ys)):\n"
        "        x = ys[i]\n"
        "        j = i - 1\n"
        "        while j >= 0 and ys[j] > x:\n"
        "            ys[j + 1] = ys[j]\n"
        "            j -= 1\n"
        "        ys[j + 1] = x\n"
        "    return ys\n",
        # selection sort
        "    ys = list(xs)\n"
        "    n = len(ys)\n"
        "    for i in range(n):\n"
        "        m = i\n"
        "        for j in range(i + 1, n):\n"
        "            if ys[j] < ys[m]:\n"
        "                m = j\n"
        "        ys[i], ys[m] = ys[m], ys[i]\n"
        "    return ys\n",
        # merge sort
        "    if len(xs) < 2:\n"
        "        return xs\n"
        "    a = sort_numbers(xs[:len(xs) // 2])\n"
        "    b = sort_numbers(xs[len(xs) // 2:])\n"
        "    out = []\n"
        "    while a and b:\n"
        "        out.append(a.pop(0) if a[0] <= b[0] else b.pop(0))\n"
        "    return out + a + b\n",
        # quick sort
        "    if len(xs) < 2:\n"
        "        return xs\n"
        "    p = xs[0]\n"
        "    lo = [x for x in xs[1:] if x < p]\n"
        "    hi = [x for x in xs[1:] if x >= p]\n"
        "    return sort_numbers(lo) + [p] + sort_numbers(hi)\n",
        # repeated minimum extraction
        "    ys = list(xs)\n"
        "    out = []\n"
        "    while ys:\n"
        "        m = min(ys)\n"
        "        ys.remove(m)\n"
        "        out.append(m)\n"
        "    return out\n",
    ),
    "max_subarray": (
        # Kadane
        "    best = cur = xs[0]\n"
        "    for x in xs[1:]:\n"
        "        cur = max(x, cur + x)\n"
        "        best = max(best, cur)\n"
        "    return best\n",
        # Kadane with a reset
        "    best = xs[0]\n"
        "    cur = 0\n"
        "    for x in xs:\n"
        "        cur += x\n"
        "        if cur > best:\n"
        "            best = cur\n"
        "        if cur < 0:\n"
        "            cur = 0\n"
        "    return best\n",
        # prefix sums minus the lowest earlier prefix
        "    best = xs[0]\n"
        "    low = 0\n"
        "    total = 0\n"
        "    for x in xs:\n"
        "        total += x\n"
        "        best = max(best, total - low)\n"
        "        low = min(low, total)\n"
        "    return best\n",
        # brute force over all start points
        "    best = xs[0]\n"
        "    for i in range(len(xs)):\n"
        "        s = 0\n"
        "        for j in range(i, len(xs)):\n"
        "            s += xs[j]\n"
        "            if s > best:\n"
        "                best = s\n"
        "    return best\n",
    ),
}

WRONG_BODIES: dict[str, tuple[str, ...]] = {
    "sorting": (
        # insertion sort shifting two places: IndexError
        "    ys = list(xs)\n"
        "    for i in range(1, len(ys)):\n"
        "        x = ys[i]\n"
        "        j = i - 1\n"
        "        while j >= 0 and ys[j] > x:\n"
        "            ys[j + 2] = ys[j]\n"
        "            j -= 1\n"
        "        ys[j + 1] = x\n"
        "    return ys\n",
        # selection sort picking the maximum: descending order
        "    ys = list(xs)\n"
        "    n = len(ys)\n"
        "    for i in range(n):\n"
        "        m = i\n"
        "        for j in range(i + 1, n):\n"
        "            if ys[j] > ys[m]:\n"
        "                m = j\n"
        "        ys[i], ys[m] = ys[m], ys[i]\n"
        "    return ys\n",
        # quick sort that drops duplicates of the pivot
        "    if len(xs) < 2:\n"
        "        return xs\n"
        "    p = xs[0]\n"
        "    lo = [x for x in xs[1:] if x < p]\n"
        "    hi = [x for x in xs[1:] if x > p]\n"
        "    return sort_numbers(lo) + [p] + sort_numbers(hi)\n",
        # minimum extraction removing the wrong thing: ValueError
        "    ys = list(xs)\n"
        "    out = []\n"
        "    while ys:\n"
        "        m = min(ys)\n"
        "        ys.remove(out)\n"
        "        out.append(m)\n"
        "    return out\n",
        # a single bubble pass
        "    ys = list(xs)\n"
        "    for i in range(len(ys) - 1):\n"
        "        if ys[i] > ys[i + 1]:\n"
        "            ys[i], ys[i + 1] = ys[i + 1], ys[i]\n"
        "    return ys\n",
        # a single bubble pass running off the end: IndexError
        "    ys = list(xs)\n"
        "    for i in range(len(ys)):\n"
        "        if ys[i] > ys[i + 1]:\n"
        "            ys[i], ys[i + 1] = ys[i + 1], ys[i]\n"
        "    return ys\n",
    ),
    "max_subarray": (
        # Kadane started at the second element: IndexError on one element
        "    best = cur = xs[1]\n"
        "    for x in xs[1:]:\n"
        "        cur = max(x, cur + x)\n"
        "        best = max(best, cur)\n"
        "    return best\n",
        # brute force running off the end: IndexError
        "    best = xs[0]\n"
        "    for i in range(len(xs)):\n"
        "        s = 0\n"
        "        for j in range(i, len(xs) + 1):\n"
        "            s += xs[j]\n"
        "            if s > best:\n"
        "                best = s\n"
        "    return best\n",
        # the largest element
        "    best = xs[0]\n"
        "    for x in xs:\n"
        "        best = max(best, x)\n"
        "    return best\n",
        # brute force adding the start element again and again
        "    best = xs[0]\n"
        "    for i in range(len(xs)):\n"
        "        s = 0\n"
        "        for j in range(i, len(xs)):\n"
        "            s += xs[i]\n"
        "            if s > best:\n"
        "                best = s\n"
        "    return best\n",
        # pairs of neighbours, running off the end: IndexError
        "    best = xs[0]\n"
        "    for i in range(len(xs)):\n"
        "        best = max(best, xs[i] + xs[i + 1])\n"
        "    return best\n",
    ),
}
