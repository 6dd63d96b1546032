/*
 * Scoring (rl_score.h).  The bench's --self-test and tests/bench checks
 * rest on these, so they are kept free of model code.
 */
#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "bench/ruler/rl_score.h"

static bool rl_alnum(char c)
{
    return isalnum((unsigned char)c) != 0;
}

bool rl_score_contains(const char *text, const char *item)
{
    size_t n = strlen(item);
    if (n == 0)
        return false;
    for (const char *p = text; *p; p++) {
        if (strncasecmp(p, item, n) != 0)
            continue;
        bool left = p == text || !rl_alnum(p[-1]) || !rl_alnum(item[0]);
        bool right = p[n] == '\0' || !rl_alnum(p[n]) || !rl_alnum(item[n - 1]);
        if (left && right)
            return true;
    }
    return false;
}

int rl_score_found(const char *text, const char (*items)[48], int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += rl_score_contains(text, items[i]);
    return k;
}

void rl_score_wilson(int k, int n, double *lo_p, double *hi_p)
{
    const double z = 1.959963984540054;
    double p = (double)k / n, z2n = z * z / n;
    double center = (p + z2n / 2) / (1 + z2n);
    double half = z * sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n);
    *lo_p = center - half < 0 ? 0 : center - half;
    *hi_p = center + half > 1 ? 1 : center + half;
}

void rl_score_agree(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t *prefix_p, size_t *same_p)
{
    size_t prefix = 0, same = 0;
    bool diverged = false;
    for (size_t i = 0; i < na; i++) {
        bool eq = i < nb && a[i] == b[i];
        same += eq;
        diverged |= !eq;
        prefix += !diverged;
    }
    *prefix_p = prefix;
    *same_p = same;
}
