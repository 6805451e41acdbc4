/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fault reporter: a write into a read-only GMS mapping dies with SIGSEGV
 * after one stderr line naming the allocation and key; other faults and sent
 * signals pass through; remove() restores the previous handler. Each fault
 * happens in a forked child whose stderr is a pipe.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gmsfixture.h"
#include "testutil.h"

static gf_gms *gms;
static uint64_t a0, a1;

static int setup(void **state)
{
	if (gt_setup(state) < 0)
		return -1;
	/* Two allocations, three keys; after commit the writer maps them read-only. */
	if (gf_gms_connect(&gms, srv.uri, mem, GF_GMS_RW, 5000, NULL) < 0 || gf_gms_allocate(gms, 1 << 20, "w0", &a0) < 0 ||
	    gf_gms_allocate(gms, 1 << 20, "w1", &a1) < 0 || gf_gms_put_meta(gms, "embed", a0, 0, "{}", 2) < 0 ||
	    gf_gms_put_meta(gms, "layers.0.qkv", a0, 8192, "{}", 2) < 0 ||
	    gf_gms_put_meta(gms, "head", a1, 512, "{}", 2) < 0 || gf_gms_commit(gms, NULL) < 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	gf_gms_fault_reporter_remove(NULL);
	gf_gms_free(gms);
	return gt_teardown(state);
}

static uint64_t key_addr(const char *key)
{
	struct gf_gms_meta m;
	OK(gf_gms_meta_get(gms, key, &m));
	return m.addr;
}

enum action { WRITE_AT, WRITE_ELSEWHERE, SEND_SIGNAL };

/* Run @what in a child (default SIGSEGV handler, then the reporter); return
 * its wait status, and its stderr in @err. */
static int in_child(enum action what, uint64_t addr, char *err, size_t errlen)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 2);
		close(fds[0]);
		signal(SIGSEGV, SIG_DFL); /* not the test framework's handler */
		if (gf_gms_fault_reporter_install(gms) < 0)
			_exit(10);
		/* volatile: the compiler must emit the store at an address it cannot know. */
		volatile uintptr_t target = what == WRITE_AT ? addr : 16;
		if (what == SEND_SIGNAL)
			kill(getpid(), SIGSEGV);
		else
			*(volatile uint8_t *)target = 5;
		_exit(11);
	}
	close(fds[1]);
	size_t n = 0;
	ssize_t r;
	while (n + 1 < errlen && (r = read(fds[0], err + n, errlen - 1 - n)) > 0)
		n += (size_t)r;
	err[n] = '\0';
	close(fds[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return status;
}

static void test_write_names_allocation_and_key(void **state)
{
	(void)state;
	char err[2048], want[256];
	int status = in_child(WRITE_AT, key_addr("layers.0.qkv") + 0x24, err, sizeof(err));
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGSEGV);
	snprintf(want, sizeof(want), "allocation %llu tag \"w0\" offset 0x2024, key \"layers.0.qkv\" +0x24",
		 (unsigned long long)a0);
	if (!strstr(err, want))
		fail_msg("no '%s' in: %s", want, err);
	assert_non_null(strstr(err, "gpufailover: SIGSEGV: "));
	assert_non_null(strstr(err, "read-only GMS mapping"));
#if defined(__x86_64__)
	assert_non_null(strstr(err, ": write to read-only"));
#endif
	/* Exactly one line. */
	assert_ptr_equal(strchr(err, '\n'), err + strlen(err) - 1);
}

static void test_second_allocation_and_no_key_before(void **state)
{
	(void)state;
	char err[2048], want[256];
	struct gf_gms_alloc_info info;
	OK(gf_gms_alloc_at(gms, 1, &info));
	int status = in_child(WRITE_AT, info.addr + 8, err, sizeof(err));
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
	snprintf(want, sizeof(want), "allocation %llu tag \"w1\" offset 0x8, no metadata key", (unsigned long long)a1);
	if (!strstr(err, want))
		fail_msg("no '%s' in: %s", want, err);
}

static void test_other_faults_and_sent_signals_pass_through(void **state)
{
	(void)state;
	char err[2048];
	int status = in_child(WRITE_ELSEWHERE, 0, err, sizeof(err));
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
	assert_null(strstr(err, "gpufailover:"));
	status = in_child(SEND_SIGNAL, 0, err, sizeof(err));
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
	assert_null(strstr(err, "gpufailover:"));
}

static void test_remove_restores_the_previous_handler(void **state)
{
	(void)state;
	struct sigaction before, during, after;
	assert_int_equal(sigaction(SIGBUS, NULL, &before), 0);
	OK(gf_gms_fault_reporter_install(gms));
	OK(gf_gms_fault_reporter_install(gms)); /* refresh: still one set of handlers */
	assert_int_equal(sigaction(SIGBUS, NULL, &during), 0);
	assert_true(during.sa_flags & SA_SIGINFO);
	assert_ptr_not_equal((void *)during.sa_sigaction, (void *)before.sa_sigaction);
	gf_gms_fault_reporter_remove(gms);
	assert_int_equal(sigaction(SIGBUS, NULL, &after), 0);
	assert_ptr_equal((void *)after.sa_handler, (void *)before.sa_handler);
	gf_gms_fault_reporter_remove(NULL); /* nothing left: a no-op */
}

static void test_bad_arguments(void **state)
{
	(void)state;
	assert_int_equal(gf_gms_fault_reporter_install(NULL), GF_ERR_INVALID_ARG);
	gf_gms *fresh = NULL;
	OK(gf_gms_connect(&fresh, srv.uri, mem, GF_GMS_RO, 5000, NULL));
	assert_int_equal(gf_gms_fault_reporter_install(fresh), GF_ERR_STATE); /* not mapped yet */
	gf_gms_free(fresh);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_names_allocation_and_key),
		cmocka_unit_test(test_second_allocation_and_no_key_before),
		cmocka_unit_test(test_other_faults_and_sent_signals_pass_through),
		cmocka_unit_test(test_remove_restores_the_previous_handler),
		cmocka_unit_test(test_bad_arguments),
	};
	return tu_run_group_tests(tests, setup, teardown);
}
