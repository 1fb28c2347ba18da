"""The Job Bridge's transport, both generations': the client over the Unix socket (client: HTTP
requests on kept-alive connections, the fetch, the generation probe), the HTTP it speaks
(http_wire), one retry policy for every loop that tries again (retry), the receive kept open
for the whole job (receiver), and no path outside the work dir (paths). Each generation's
routes are in its training folder."""
