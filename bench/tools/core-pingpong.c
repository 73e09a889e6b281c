/* Cache-line round trip between two cores: bench/core-pingpong.sh. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 2000000L

static _Alignas(64) atomic_long line;
static int core_a, core_b;

static void pin(int c)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(c, &s);
	pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *unused)
{
	(void)unused;
	pin(core_a);
	for (long i = 0; i < N; i++) {
		while (atomic_load_explicit(&line, memory_order_acquire) != 2 * i + 1)
			;
		atomic_store_explicit(&line, 2 * i + 2, memory_order_release);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	core_a = argc > 1 ? atoi(argv[1]) : 0;
	core_b = argc > 2 ? atoi(argv[2]) : 1;
	pthread_t t;
	pthread_create(&t, NULL, pong, NULL);
	pin(core_b);
	struct timespec s, e;
	clock_gettime(CLOCK_MONOTONIC, &s);
	for (long i = 0; i < N; i++) {
		atomic_store_explicit(&line, 2 * i + 1, memory_order_release);
		while (atomic_load_explicit(&line, memory_order_acquire) != 2 * i + 2)
			;
	}
	clock_gettime(CLOCK_MONOTONIC, &e);
	pthread_join(t, NULL);
	double ns = ((e.tv_sec - s.tv_sec) * 1e9 + (e.tv_nsec - s.tv_nsec)) / N;
	printf("{\"benchmark\":\"core-pingpong\",\"cores\":[%d,%d],\"round_trip_ns\":%.1f}\n",
	       core_a, core_b, ns);
	return 0;
}
