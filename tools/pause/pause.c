/* The pod sandbox's process: it holds the pod's namespaces open and does nothing else. As PID 1 of
 * the pod it also reaps the zombies that processes sharing its PID namespace leave behind.
 * Built static (gcc -static) into an image of its own by tests/plane/images.py. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("edl pause");
        return 0;
    }
    struct sigaction stop = {.sa_handler = leave};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigemptyset(&stop.sa_mask);
    sigemptyset(&child.sa_mask);
    if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) || sigaction(SIGCHLD, &child, NULL)) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;)
        pause();
}
