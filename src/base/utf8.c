/* utf8.c — UTF-8 checking and conversion (see utf8.h for the rules). */
#include "base/utf8.h"

#include <string.h>

#include "base/buf.h"

size_t utf8_next(const unsigned char *s, size_t n, size_t *err_len, int *incomplete) {
    unsigned char c = s[0];
    *incomplete = 0;
    if (c < 0x80) return 1;
    size_t need;
    /* The second byte's range is narrower after four leads (table 3-7):
     * that is what excludes overlong forms, surrogates and > U+10FFFF. */
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *err_len = 1;
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *incomplete = 1;
            *err_len = i;
            return 0;
        }
        unsigned char b = s[i];
        unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *err_len = i;
            return 0;
        }
    }
    return need;
}

size_t utf8_decode_lossy(const char *s, size_t n, uint32_t *cp) {
    size_t el;
    int inc;
    size_t k = utf8_next((const unsigned char *)s, n, &el, &inc);
    if (!k) {
        *cp = 0xFFFD;
        return el;
    }
    utf8_decode(s, cp);
    return k;
}

size_t utf8_validate(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs dominate real text: skip them eight bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t el;
        int inc;
        size_t k = utf8_next(u + i, n - i, &el, &inc);
        if (!k) return i;
        i += k;
    }
    return n;
}

size_t utf8_cut(const char *s, size_t n) {
    if (!n) return 0;
    const unsigned char *u = (const unsigned char *)s;
    size_t i = utf8_prev(s, n > 4 ? n - 4 : 0, n);
    size_t el;
    int inc;
    if (!utf8_next(u + i, n - i, &el, &inc) && inc) return i;
    return n;
}

size_t utf8_count(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; count++) {
        uint32_t cp;
        i += (unsigned char)s[i] < 0x80 ? 1 : utf8_decode_lossy(s + i, n - i, &cp);
    }
    return count;
}

size_t utf8_offset(const char *s, size_t n, size_t index) {
    size_t i = 0;
    for (; index > 0 && i < n; index--) {
        uint32_t cp;
        i += (unsigned char)s[i] < 0x80 ? 1 : utf8_decode_lossy(s + i, n - i, &cp);
    }
    return i;
}

size_t utf8_lossy_append(struct buf *out, const char *s, size_t n, int final) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    buf_reserve(out, n);
    while (i < n) {
        size_t el;
        int inc;
        size_t k = utf8_next(u + i, n - i, &el, &inc);
        if (k) {
            i += k;
            continue;
        }
        buf_append(out, s + run, i - run);
        if (inc && !final) return i;
        buf_append(out, "\xEF\xBF\xBD", 3);
        i += el;
        run = i;
    }
    buf_append(out, s + run, i - run);
    return i;
}
