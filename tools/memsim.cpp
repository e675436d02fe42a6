// memsim command line entry point. Subcommands live in tools/cli/.
#include <cstdio>
int main() { std::puts("memsim: under construction"); return 0; }
