// Built with every object of the loader's code (src/loader, link_whole) and the layers below it,
// and without src/convert or src/merge: that it links at all is the check (issue 23: the library
// that loads links without the one that converts).
#include "zckpt/loader.h"

int main() { return 0; }
