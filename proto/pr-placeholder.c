/* pr-placeholder.c — keeps the proto library non-empty until the codec lands. */
int pr_placeholder(void);
int pr_placeholder(void) { return 0; }
