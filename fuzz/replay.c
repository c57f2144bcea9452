/* Replays files (or every file in directories) through
 * LLVMFuzzerTestOneInput without libFuzzer, so the corpus can be checked
 * with gcc and the sanitizers:
 *   gcc -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
 *       -Isrc/shared -Isrc/worker -Isrc/manager fuzz/replay.c fuzz/fuzz_http.c src/shared/nw_http.c -o replay
 *   ./replay fuzz/corpus
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *data;
    long size;

    if (!fp || fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0
        || fseek(fp, 0, SEEK_SET) != 0) {
        perror(path);
        if (fp)
            fclose(fp);
        return -1;
    }
    /* Exactly size bytes, so the sanitizer sees any read past the end. */
    data = malloc(size ? (size_t)size : 1);
    if (!data || fread(data, 1, (size_t)size, fp) != (size_t)size) {
        perror(path);
        fclose(fp);
        free(data);
        return -1;
    }
    fclose(fp);
    LLVMFuzzerTestOneInput(data, (size_t)size);
    free(data);
    return 1;
}

static int replay_path(const char *path)
{
    struct stat st;
    DIR *dir;
    struct dirent *e;
    int n = 0;

    if (stat(path, &st) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return replay_file(path);
    if (!(dir = opendir(path))) {
        perror(path);
        return -1;
    }
    while ((e = readdir(dir)) != NULL) {
        char full[4096];
        int r;
        if (e->d_name[0] == '.')
            continue;
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (stat(full, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if ((r = replay_file(full)) < 0) {
            closedir(dir);
            return -1;
        }
        n += r;
    }
    closedir(dir);
    return n;
}

int main(int argc, char **argv)
{
    int i, total = 0;

    for (i = 1; i < argc; i++) {
        int r = replay_path(argv[i]);
        if (r < 0)
            return 2;
        total += r;
    }
    printf("replayed %d files\n", total);
    return 0;
}
