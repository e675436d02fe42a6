/* spawn_bench: wall-clock and CPU time of whole cold processes (issue #20's cold-run target).
 *
 *   spawn_bench RUNS ROUNDS CMD_A... [:: CMD_B... [:: ...]]
 *
 * Each round starts every command RUNS times, the commands alternating run by run (A B A B
 * ...), each with posix_spawn (stdout and stderr to /dev/null) and waited for with wait4;
 * it prints, per round and command, the min and median wall time from spawn to reap
 * (CLOCK_MONOTONIC) and the min CPU time (user + system of the child's rusage), in ms.
 * Alternating within a round is what makes two binaries comparable on a machine whose
 * speed drifts over minutes (a shared VM). Not built by CMake (a plain C program:
 * `cc -O2 -o /tmp/spawn_bench tools/bench/spawn_bench.c`). */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s RUNS ROUNDS CMD_A... [:: CMD_B...]\n", argv[0]);
    return 2;
  }
  const int runs = atoi(argv[1]), rounds = atoi(argv[2]);
  if (runs < 1 || rounds < 1) return 2;
  char** cmds[16];
  int ncmd = 0;
  cmds[ncmd++] = &argv[3];
  for (int i = 3; i < argc; ++i)
    if (strcmp(argv[i], "::") == 0) {
      argv[i] = NULL;
      if (ncmd == 16 || i + 1 >= argc) return 2;
      cmds[ncmd++] = &argv[i + 1];
    }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  double* wall = malloc(sizeof(double) * (size_t)runs * (size_t)ncmd);
  double* cpu = malloc(sizeof(double) * (size_t)runs * (size_t)ncmd);
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < runs; ++k)
      for (int c = 0; c < ncmd; ++c) {
        pid_t pid;
        int status;
        struct rusage ru;
        const double t0 = now_ms();
        if (posix_spawn(&pid, cmds[c][0], &fa, NULL, cmds[c], environ) != 0) {
          perror(cmds[c][0]);
          return 1;
        }
        if (wait4(pid, &status, 0, &ru) != pid) return 1;
        wall[c * runs + k] = now_ms() - t0;
        cpu[c * runs + k] = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
                            (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
        if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3)) {
          fprintf(stderr, "%s: exit status %d\n", cmds[c][0], status);
          return 1;
        }
      }
    for (int c = 0; c < ncmd; ++c) {
      qsort(&wall[c * runs], (size_t)runs, sizeof(double), cmp_double);
      qsort(&cpu[c * runs], (size_t)runs, sizeof(double), cmp_double);
      const double med = runs % 2 ? wall[c * runs + runs / 2]
                                  : (wall[c * runs + runs / 2 - 1] + wall[c * runs + runs / 2]) / 2;
      printf("round %d  %-40s wall min %.3f median %.3f  cpu min %.3f ms\n", r + 1, cmds[c][0],
             wall[c * runs], med, cpu[c * runs]);
    }
    fflush(stdout);
  }
  return 0;
}
