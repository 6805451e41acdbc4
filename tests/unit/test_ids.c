/* SPDX-License-Identifier: Apache-2.0 */
/* The one id rule, and every place that configures an id refusing what the lock server would refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "gpufailover/engine.h"
#include "gpufailover/lock.h"
#include "wire.h"

static void fill(char *buf, size_t n)
{
	memset(buf, 'a', n);
	buf[n] = '\0';
}

static void test_rule(void **state)
{
	(void)state;
	char id[GF_ID_MAX + 8];
	fill(id, GF_ID_MAX - 1);
	assert_true(gf_id_valid(id));
	fill(id, GF_ID_MAX);
	assert_false(gf_id_valid(id)); /* 128 bytes do not fit the schema's 128-byte buffer with its NUL */
	static const char *bad[] = { "", "a b", "a\nb", "a\"b", "a\\b", "a=b", "utf8-\xc3\xa9", "tab\t", "del\x7f" };
	for (size_t i = 0; i < GF_ARRAY_SIZE(bad); i++)
		assert_false(gf_id_valid(bad[i]));
	assert_false(gf_id_valid(NULL));
	assert_true(gf_id_valid("engine-0/gpu:1.a_b"));
	assert_int_equal(gf_id_check("ok", "t"), 0);
	assert_int_equal(gf_id_check("a b", "t"), GF_ERR_INVALID_ARG);
}

/* The engine used to accept a 128-byte id that gf_lock_new() refuses, so a
 * bad id failed only at acquire, after the weights were loaded. */
static void test_engine_refuses_at_configuration(void **state)
{
	(void)state;
	char id[GF_ID_MAX + 1];
	gf_engine *e;
	assert_int_equal(gf_engine_new(&e), 0);
	fill(id, GF_ID_MAX);
	assert_int_equal(gf_engine_set_lock(e, "unix:///tmp/x.sock", id), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_lock(e, "unix:///tmp/x.sock", "bad id"), GF_ERR_INVALID_ARG);
	assert_int_equal(gf_engine_set_lock(e, "unix:///tmp/x.sock", "line\nbreak"), GF_ERR_INVALID_ARG);
	fill(id, GF_ID_MAX - 1);
	assert_int_equal(gf_engine_set_lock(e, "unix:///tmp/x.sock", id), 0);
	gf_engine_free(e);
}

static void test_lock_client_same_rule(void **state)
{
	(void)state;
	char id[GF_ID_MAX + 1];
	gf_lock *l = NULL;
	fill(id, GF_ID_MAX);
	assert_int_equal(gf_lock_new(&l, "unix:///tmp/x.sock", id), GF_ERR_INVALID_ARG);
	assert_null(l);
	fill(id, GF_ID_MAX - 1);
	assert_int_equal(gf_lock_new(&l, "unix:///tmp/x.sock", id), 0);
	gf_lock_free(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rule),
		cmocka_unit_test(test_engine_refuses_at_configuration),
		cmocka_unit_test(test_lock_client_same_rule),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
