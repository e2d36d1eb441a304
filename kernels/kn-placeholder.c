/* kn-placeholder.c — keeps the kernels library non-empty until the backends land. */
int kn_placeholder(void);
int kn_placeholder(void) { return 0; }
