/* The world (lib/comm/world.c) in one process: what a process started
 * without a launcher is (a one-rank singleton: rank 0 of 1, its own host
 * and pid, an all-gather that copies), and the refusals its environment
 * can provoke: the variables of a launcher that started separate
 * singletons, a stale PMIX_NAMESPACE without a server, a deadline that is
 * not positive, each with its exact message.
 *
 * Joining a real job is multi-rank and runs under real launchers:
 * tests/cluster/launch.bats (flow's --nproc launcher with 1 to 4 ranks,
 * srun --mpi=none refused by every task, a stale PMIx environment under
 * srun), tests/cluster/comm.bats (the start-up exchange under --nproc,
 * srun on one and two nodes, mpirun and a batch job) and
 * tests/cluster/faults.bats (ranks that die or stall).
 *
 * libpmix keeps state from PMIx_Init, even a failed one, for the life of
 * the process, so every refusal runs in a child process of its own; the
 * singleton the other tests share is made only after them. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <flow/world.h>

#include "worldutil.h"

/* What flow_world_init gave in a child process. */
typedef struct init_result {
	flow_err_t err;
	bool out_null;      /* *out was NULL on return */
	int rank, size;
	char launcher[16];
	char msg[FLOW_DIAG_MAX];
} init_result_t;

/* flow_world_init in a child process with name=value added to the
 * environment; the world it makes is freed there. */
static init_result_t init_in_child(const char *name, const char *value)
{
	init_result_t res;
	int fds[2];
	memset(&res, 0, sizeof(res));
	assert_int_equal(pipe(fds), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		flow_world_t *w = (flow_world_t *)&res; /* must become NULL */
		flow_diag_t diag = FLOW_DIAG_INIT;
		close(fds[0]);
		setenv(name, value, 1);
		res.err = flow_world_init(&w, 5.0, &diag);
		res.out_null = w == NULL;
		snprintf(res.msg, sizeof(res.msg), "%s", diag.msg);
		if (res.err == FLOW_OK) {
			const flow_world_info_t *info = flow_world_info(w);
			res.rank = info->rank;
			res.size = info->size;
			snprintf(res.launcher, sizeof(res.launcher), "%s",
				 info->launcher);
			if (flow_world_free(w, &diag) != FLOW_OK)
				res.err = diag.err;
		}
		ssize_t n = write(fds[1], &res, sizeof(res));
		_exit(n == (ssize_t)sizeof(res) ? 0 : 1);
	}
	close(fds[1]);
	size_t got = 0;
	while (got < sizeof(res)) {
		ssize_t n = read(fds[0], (char *)&res + got, sizeof(res) - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fds[0]);
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(got, sizeof(res));
	return res;
}

/* ---- refusals, each in a child ------------------------------------------- */

static void assert_separate_singletons_refused(const char *name,
					       const char *value)
{
	char want[FLOW_DIAG_MAX];
	init_result_t res = init_in_child(name, value);
	snprintf(want, sizeof(want),
		 "this process is one of %s tasks (%s) but no PMIx server answered: launch with 'srun --mpi=pmix', 'mpirun' or '--nproc', not as separate singletons",
		 value, name);
	assert_int_equal(res.err, FLOW_ERR_USAGE);
	assert_true(res.out_null);
	assert_string_equal(res.msg, want);
}

static void test_world_refuses_tasks_of_a_slurm_step_without_pmix(void **state)
{
	(void)state;
	assert_separate_singletons_refused("SLURM_STEP_NUM_TASKS", "4");
}

static void test_world_refuses_tasks_of_a_pmi_job_without_pmix(void **state)
{
	(void)state;
	assert_separate_singletons_refused("PMI_SIZE", "2");
}

static void test_world_refuses_tasks_of_an_openmpi_job_without_pmix(void **state)
{
	(void)state;
	assert_separate_singletons_refused("OMPI_COMM_WORLD_SIZE", "16");
}

/* One task, or a batch script outside any step (SLURM_NTASKS), is a
 * singleton as it should be. */
static void test_world_takes_one_task_and_a_batch_script_as_a_singleton(void **state)
{
	static const char *const cases[][2] = {
		{ "SLURM_STEP_NUM_TASKS", "1" },
		{ "PMI_SIZE", "1" },
		{ "OMPI_COMM_WORLD_SIZE", "1" },
		{ "SLURM_NTASKS", "8" },
	};
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		init_result_t res = init_in_child(cases[i][0], cases[i][1]);
		assert_int_equal(res.err, FLOW_OK);
		assert_int_equal(res.rank, 0);
		assert_int_equal(res.size, 1);
		assert_string_equal(res.launcher, "singleton");
	}
}

static void test_world_refuses_a_stale_pmix_namespace(void **state)
{
	(void)state;
	init_result_t res = init_in_child("PMIX_NAMESPACE", "slurm.pmix.41.0");
#ifdef HAVE_PMIX
	assert_int_equal(res.err, FLOW_ERR_USAGE);
	assert_true(res.out_null);
	assert_string_equal(res.msg,
			    "PMIX_NAMESPACE is set ('slurm.pmix.41.0') but its PMIx server cannot be reached: a stale launcher environment?");
#else
	/* Without libpmix nothing reads it. */
	assert_int_equal(res.err, FLOW_OK);
	assert_int_equal(res.size, 1);
#endif
}

/* Checked before PMIx is touched, so in this process. */
static void test_world_refuses_a_deadline_that_is_not_positive(void **state)
{
	static const double bad[] = { 0.0, -1.5 };
	static const char *const want[] = {
		"the communication deadline must be positive, got 0 s",
		"the communication deadline must be positive, got -1.5 s",
	};
	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		flow_world_t *w = (flow_world_t *)&w; /* must become NULL */
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_world_init(&w, bad[i], &diag),
				 FLOW_ERR_USAGE);
		assert_null(w);
		assert_string_equal(diag.msg, want[i]);
	}
}

/* ---- the singleton ---------------------------------------------------------- */

static flow_world_t *world;

static int singleton_setup(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	if (flow_world_init(&world, 2.5, &diag) != FLOW_OK) {
		print_error("%s\n", diag.msg);
		return -1;
	}
	return 0;
}

static int singleton_teardown(void **state)
{
	(void)state;
	return flow_world_free(world, NULL) == FLOW_OK ? 0 : -1;
}

static void test_world_without_a_launcher_is_rank_0_of_1(void **state)
{
	const flow_world_info_t *info = flow_world_info(world);
	char host[256] = "";
	(void)state;
	assert_int_equal(info->rank, 0);
	assert_int_equal(info->size, 1);
	assert_int_equal(info->local_rank, 0);
	assert_int_equal(info->local_size, 1);
	assert_int_equal(info->node, 0);
	assert_int_equal(info->num_nodes, 1);
	assert_string_equal(info->launcher, "singleton");
	assert_string_equal(info->job, "");
	/* No launcher names the node: the kernel's name it is. */
	assert_int_equal(gethostname(host, sizeof(host)), 0);
	host[FLOW_HOST_MAX - 1] = '\0';
	assert_string_equal(info->host, host);
	assert_true(flow_world_timeout(world) == 2.5);
}

static void test_world_singleton_knows_its_only_rank(void **state)
{
	const flow_world_info_t *info = flow_world_info(world);
	(void)state;
	assert_string_equal(flow_world_host_of(world, 0), info->host);
	assert_int_equal(flow_world_node_of(world, 0), 0);
	assert_int_equal(flow_world_pid_of(world, 0), (int)getpid());
	/* Nobody to connect to it: no listening socket, no address. */
	assert_int_equal(flow_world_listen_fd(world), -1);
	assert_string_equal(flow_world_addr_of(world, 0), "");
	assert_true(info->job_hash == flow_job_hash(""));
}

static void test_world_singleton_allgather_copies_its_own(void **state)
{
	const char mine[6] = "abcde";
	char all[8];
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	memset(all, 'x', sizeof(all));
	assert_int_equal(flow_world_allgather(world, "test.one", mine,
					      sizeof(mine), all, &diag),
			 FLOW_OK);
	assert_memory_equal(all, mine, sizeof(mine));
	assert_int_equal(all[sizeof(mine)], 'x');
	assert_int_equal(diag.err, FLOW_OK);
}

static void test_world_job_hash_is_fnv1a_64(void **state)
{
	(void)state;
	/* The published FNV-1a test vectors. */
	assert_true(flow_job_hash("") == UINT64_C(0xcbf29ce484222325));
	assert_true(flow_job_hash("a") == UINT64_C(0xaf63dc4c8601ec8c));
	assert_true(flow_job_hash("foobar") == UINT64_C(0x85944171f73967e8));
}

static void test_world_free_and_abort_accept_null(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	assert_int_equal(flow_world_free(NULL, &diag), FLOW_OK);
	flow_world_abort(NULL, 1, "unused");
	assert_int_equal(diag.err, FLOW_OK);
}

int main(void)
{
	const struct CMUnitTest refusals[] = {
		cmocka_unit_test(test_world_refuses_tasks_of_a_slurm_step_without_pmix),
		cmocka_unit_test(test_world_refuses_tasks_of_a_pmi_job_without_pmix),
		cmocka_unit_test(test_world_refuses_tasks_of_an_openmpi_job_without_pmix),
		cmocka_unit_test(test_world_takes_one_task_and_a_batch_script_as_a_singleton),
		cmocka_unit_test(test_world_refuses_a_stale_pmix_namespace),
		cmocka_unit_test(test_world_refuses_a_deadline_that_is_not_positive),
	};
	const struct CMUnitTest singleton[] = {
		cmocka_unit_test(test_world_without_a_launcher_is_rank_0_of_1),
		cmocka_unit_test(test_world_singleton_knows_its_only_rank),
		cmocka_unit_test(test_world_singleton_allgather_copies_its_own),
		cmocka_unit_test(test_world_job_hash_is_fnv1a_64),
		cmocka_unit_test(test_world_free_and_abort_accept_null),
	};
	/* An inherited launcher variable would change what init sees. */
	worldutil_clear_launcher_environment();
	int failed = cmocka_run_group_tests_name("refusals", refusals, NULL,
						 NULL);
	return failed + cmocka_run_group_tests_name("singleton", singleton,
						    singleton_setup,
						    singleton_teardown);
}
