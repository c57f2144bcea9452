/* A tiny TAP producer for the C unit tests: ok(), is(), is_str(), diag(),
 * done_testing(). Single translation unit only (state is static). */
#ifndef NW_TAP_H
#define NW_TAP_H

#include <stdio.h>
#include <string.h>

static int tap_run, tap_failed;

#define diag(...) do { printf("# "); printf(__VA_ARGS__); printf("\n"); } while (0)

static int tap_ok(int pass, const char *file, int line, const char *name)
{
    tap_run++;
    if (!pass)
        tap_failed++;
    printf("%sok %d - %s\n", pass ? "" : "not ", tap_run, name);
    if (!pass)
        printf("#   Failed test '%s'\n#   at %s line %d.\n", name, file, line);
    fflush(stdout);
    return pass;
}

#define ok(cond, name) tap_ok(!!(cond), __FILE__, __LINE__, (name))

/* Integers, compared as long long. */
#define is(got, want, name) do {                                            \
    long long is_g_ = (long long)(got), is_w_ = (long long)(want);          \
    if (!tap_ok(is_g_ == is_w_, __FILE__, __LINE__, (name)))                \
        printf("#          got: %lld\n#     expected: %lld\n", is_g_, is_w_); \
} while (0)

/* A (pointer, length) string against a C string. */
#define is_str(got, got_len, want, name) do {                               \
    const char *is_g_ = (got), *is_w_ = (want);                             \
    size_t is_gl_ = (got_len), is_wl_ = strlen(is_w_);                      \
    int is_p_ = is_g_ != NULL && is_gl_ == is_wl_                           \
                && memcmp(is_g_, is_w_, is_wl_) == 0;                       \
    if (!tap_ok(is_p_, __FILE__, __LINE__, (name)))                         \
        printf("#          got: '%.*s' (%zu)\n#     expected: '%s'\n",      \
               is_g_ ? (int)is_gl_ : 6, is_g_ ? is_g_ : "(null)",           \
               is_gl_, is_w_);                                              \
} while (0)

static int done_testing(void)
{
    printf("1..%d\n", tap_run);
    if (tap_failed)
        printf("# Looks like you failed %d test%s of %d.\n", tap_failed,
               tap_failed == 1 ? "" : "s", tap_run);
    return tap_failed ? 1 : 0;
}

#endif
