/* The one-rank world the unit tests that need ranks share: a process
 * started without a launcher is a singleton (rank 0 of 1), once the
 * variables an outer launcher may have left behind are gone.  None of it
 * uses cmocka, so group setup and teardown can call it. */
#ifndef FLOW_TEST_WORLDUTIL_H
#define FLOW_TEST_WORLDUTIL_H

#include <flow/comm.h>
#include <flow/world.h>

/* Remove the variables that would tell flow_world_init or flow_launch that
 * this process is one of several tasks, or where its PMIx server is. */
void worldutil_clear_launcher_environment(void);

/* Clear the launcher environment, join a singleton world with deadline
 * timeout_s and make its CPU world communicator.  Returns 0 with both set,
 * or -1 after printing the error on stderr. */
int worldutil_singleton_open(double timeout_s, flow_world_t **world_out,
			     flow_comm_t **comm_out);

/* Free comm and leave world.  Returns 0, or -1 when leaving fails. */
int worldutil_singleton_close(flow_world_t *world, flow_comm_t *comm);

/* A cmocka group's setup and teardown (its state argument unused): open
 * the singleton world (deadline 5 s) into worldutil_world and
 * worldutil_comm, and close them. */
extern flow_world_t *worldutil_world;
extern flow_comm_t *worldutil_comm;
int worldutil_setup(void **state);
int worldutil_teardown(void **state);

#endif
